"""A small multilingual glossary of tool-domain words, so a request in another language can
meet English tool descriptions.

Tool catalogs are written in English; a German, Japanese or Russian request shares no word
with them. Each line maps an English term to the forms that say it in de, es, fr, pt, it, nl,
ru, tr, pl, id, vi, ja, zh and ko: word starts for alphabetic scripts (a form matches any
word it begins), substrings for unsegmented scripts (CJK, kana). Written from the catalogs'
own vocabulary (actions and objects tools name), never from an evaluation set.
"""

from __future__ import annotations

import re
from functools import lru_cache

# Arabic-script spelling variants and marks (harakat, tatweel), unified; the article and the
# clitics before it taken off a word ("والروابط" reads "روابط"); Persian's ZWNJ splits words;
# Indic nukta and candrabindu unified. Both the glossary's forms and a turn's text are normalized.
_ARABIC_MARKS = re.compile("[\u064B-\u065F\u0670\u0640]")
_ARABIC_LETTERS = str.maketrans({"أ": "ا", "إ": "ا", "آ": "ا", "ٱ": "ا", "ى": "ي", "ة": "ه", "ی": "ي", "ک": "ك",
                                 "\u200c": " ", "\u093c": None, "\u0901": "\u0902", "\u09bc": None})
_ARTICLE = re.compile("(?<![\u0600-\u06FF])(?:[وف]?[بلك]?ال|لل)(?=[\u0600-\u06FF]{2})")


@lru_cache(maxsize=4096)
def normalized(text: str) -> str:
    """`text` with Arabic-script and Indic spelling variants unified (ASCII text as it is)."""
    if text.isascii():
        return text
    return _ARTICLE.sub("", _ARABIC_MARKS.sub("", text).translate(_ARABIC_LETTERS))

_GLOSSARY = """
create: erstell anleg crea crée créer cria criar maak aanmak созда oluştur utwórz stwórz buat tạo 作成 作って 作る 创建
    新建 建立 만들 생성
new: neue neuen neues nuev nouv novo nova nuov nieuw нов yeni nowy nową baru mới 新しい 新規 新的 새로운
delete: lösch elimin borr supprim efface exclu apag cancell verwijder удал silin usuń hapus xóa 削除 消して 删除 刪除
    삭제 지워
remove: entfern quita retir rimuov убер kaldır
list: auflist liste lista elenc lijst перечисл список listele wymień daftar liệt 一覧 列出 列表 목록
show: zeig muestr mostr montr affich mostra toon покаж göster pokaż tampil hiển 見せ 表示 显示 顯示 展示 보여
search: such busc cherch recherch pesquis procur ricerc cercami zoek ищи поиск ara szuk cari tìm 検索 探して 探す 搜索
    查找 寻找 검색 찾아
find: finde encuentr trouv encontr trova vind найд znajdź temukan 見つけ 找到 找一
read: lies lese lee leer lis lire ler legg lees прочит читай oku przeczytaj czytaj baca đọc 読んで 読む 读取 读一 讀取 읽어
write: schreib escrib écri escrev scriv schrijf напиш запиш yaz napisz tulis viết 書いて 書き 写入 寫入 써 줘
save: speicher guard enregistr salv opslaan сохран kaydet zapisz simpan lưu 保存 存储 저장
update: aktualis actualiz atualiz aggiorn bijwerk обнов güncelle zaktualizuj perbarui cập 更新 업데이트
edit: bearbeit modific änder wijzig редакт измени düzenle edytuj sửa 編集 编辑 수정
move: verschieb mueve mover déplac sposta verplaats перемест taşı przenieś pindah 移動 移动 이동 옮겨
rename: umbenenn renombr renomm renome rinomin hernoem переимен
copy: kopier copia copie kopieer копир kopyala skopiuj salin コピー 复制 복사
open: öffne abre abrir ouvr apri открой otwórz buka mở 開いて 開く 打开 열어
close: schließ cierr ferm chiud sluit закр kapat zamknij tutup đóng 閉じ 关闭 닫아
merge: zusammenführ fusion mescl unisci слей birleştir scal gabung マージ 合并 병합
send: sende envía enviar envoi envoy invia stuur отправ gönder wyślij kirim gửi 送信 送って 发送 發送 보내
post: poste publica publie pubblic plaats опублик paylaş opublikuj 投稿 发布 게시
message: nachricht mensaj messag mensag messagg bericht сообщ mesaj wiadomoś pesan nhắn メッセージ 消息 訊息 메시지
channel: kanal canal kanaal канал チャンネル 频道 頻道 채널
reply: antwort respond répond rispond beantwoord ответ yanıtla odpowiedz balas 返信 回复 답장
file: datei archivo fichier ficheiro arquivo bestand файл dosya plik berkas tệp ファイル 文件 檔案 파일
directory: ordner verzeichnis carpeta dossier répertoire pasta diretório cartella папк каталог klasör katalog
    thư mục フォルダ ディレクトリ 文件夹 目录 폴더 디렉터리
branch: zweig rama branche ramo ветк gałąź gałęzi nhánh ブランチ 分支 브랜치
repository: repositor dépôt depósito репозитор depo 存储库 仓库 倉庫 リポジトリ 저장소 레포
pull request: プルリク 拉取请求 合并请求 풀 리퀘스트 풀리퀘스트 пулл-реквест пул-реквест
issue: ticket incidenc fehlerbericht тикет задач zgłoszen イシュー 课题 议题 議題 이슈 티켓
bug: fehler error erreur erro errore fout ошибк hata błąd lỗi バグ 错误 錯誤 버그 오류
comment: kommentar comentari commentaire commento opmerking коммент yorum komentarz komentar bình luận コメント 评论
    評論 댓글 코멘트
commit: コミット 提交 커밋 коммит
page: seite página pagina страниц sayfa stron halaman trang ページ 页面 頁面 페이지
user: benutzer usuario utilisateur usuário utente gebruiker пользоват kullanıcı użytkownik pengguna ユーザー 用户
    使用者 사용자
project: projekt proyecto projet projeto progetto проект proje projek dự án プロジェクト 项目 專案 프로젝트
team: equipo équipe equipe squadra команд takım zespół nhóm チーム 团队 팀
customer: kunde cliente klant клиент müşteri klient pelanggan khách 顧客 客户 客戶 고객
invoice: rechnung factur fattur faktur счет счёт fatura tagihan hóa đơn 請求書 发票 發票 인보이스 청구서
payment: zahlung pago paiement pagament betaling платеж платёж ödeme płatnoś pembayaran thanh toán 支払 支付 付款 결제
refund: erstatt reembols rembours rimbors terugbetal возврат iade zwrot pengembalian hoàn tiền 返金 退款 환불
subscription: abonnement abo suscrip assinatura abbonament подписк abonelik subskrypc langganan 購読 サブスク 订阅 구독
price: preis precio prix preço prezz prijs цен fiyat harga 価格 价格 價格 가격
product: produkt producto produit produto prodott продукт ürün produk sản phẩm 製品 商品 产品 제품 상품
log: protokoll registro journal логи лог günlük dziennik 日志 日誌 ログ 로그
alarm: alarma alerta alerte allarm алерт аларм тревог uyarı 警报 アラーム アラート 경보 알람
metric: metrik métrica métrique metrica метрик metryk 指标 メトリクス 지표 메트릭
database: datenbank "base de datos" "base de données" "banco de dados" "base di dati" "база данных" veritabanı
    "baza danych" "basis data" データベース 数据库 資料庫 데이터베이스
table: tabelle tabla tableau tabela tabella tabel таблиц tablo テーブル 数据表 表格 테이블
screenshot: bildschirmfoto captura capture schermata скриншот снимок "ekran görüntüsü" zrzut "tangkapan layar"
    "chụp màn hình" スクリーンショット 截图 截圖 스크린샷
browser: navegador navigateur браузер tarayıcı przeglądark peramban "trình duyệt" ブラウザ 浏览器 브라우저
click: klick clic clique клик tıkla kliknij nhấp クリック 点击 클릭
web: internet интернет 网上 ウェブ 웹 网络 網路
news: nachrichten noticia actualité notícia notizi nieuws новост haber berita "tin tức" ニュース 新闻 新聞 뉴스
image: bild imagen imagem immagin afbeelding изображен картин resim obraz gambar 画像 图片 圖片 이미지
video: vidéo vídeo видео 動画 视频 비디오 동영상
restaurant: restaurante ristorant ресторан restoran restauracj "nhà hàng" レストラン 餐厅 餐廳 식당 레스토랑 ラーメン 拉面 寿司
cafe: café caffè кафе kafe kawiarni "quán cà phê" カフェ 咖啡 카페
near: nähe cerca près perto vicino buurt рядом около yakın blisko dekat gần 近く 附近 근처
directions: wegbeschreibung route ruta itinéraire trajet percorso маршрут "yol tarifi" trasa rute "chỉ đường"
    道順 行き方 路线 路線 길찾기 경로
distance: entfernung distancia distância distanza afstand расстоян mesafe odległoś jarak "khoảng cách" 距離 距离
    거리
place: lugar lieu luogo plaats место yer miejsc tempat "địa điểm" 場所 地点 地點 장소
address: adresse dirección endereço indirizzo adres адрес alamat "địa chỉ" 住所 地址 주소
time: uhrzeit hora heure horário время saat czas godzin waktu giờ 時間 時刻 何時 时间 几点 幾點 시간 "몇 시"
timezone: zeitzone "zona horaria" fuseau fuso tijdzone "часовой пояс" "saat dilimi" "strefa czasowa"
    "zona waktu" "múi giờ" タイムゾーン 时区 時區 시간대
convert: umrechn konvert convier convert omzet конверт dönüştür przelicz konversi "chuyển đổi" 変換 换算 转换 변환
keyword: schlüsselwort suchbegriff "palabra clave" "palabras clave" mot-clé mots-clés "mot clé" palavra-chave
    palavras-chave "parola chiave" zoekwoord "ключевые слова" "ключевое слово" "anahtar kelime"
    "słowa kluczowe" "kata kunci" "từ khóa" キーワード 关键词 關鍵字 키워드
ranking: clasificación classement posicion позици sıralama pozycj peringkat "xếp hạng" 順位 ランキング 排名 순위
backlink: rückverweis "enlaces entrantes" "liens entrants" "обратные ссылки" 被リンク 反向链接 백링크
domain: dominio domaine domínio домен domena "tên miền" ドメイン 域名 도메인
website: webseite sitio "site web" сайт "web sitesi" witryn situs ウェブサイト サイト 网站 網站 웹사이트
email: correo courriel почт письм e-posta poczt メール 邮件 郵件 이메일
release: lanzamiento versión publicación lançamento rilascio релиз выпуск sürüm wydanie rilis リリース 版本 릴리스
tag: etiqueta étiquette etichett метк тег etiket タグ 标签 標籤 태그
notification: benachrichtig notificac notific melding уведомл bildirim powiadom notifikasi "thông báo" 通知 알림
deploy: bereitstell desplieg déploi implant развер dağıt wdroż terapkan "triển khai" デプロイ 部署 배포
pod: ポッド 파드 под поды
cluster: clúster кластер küme klaster cụm クラスタ 集群 클러스터
scale: skalier escal redimension масштаб ölçekle skaluj スケール 扩容 缩放 확장 스케일
restart: neustart reinici redémarr riavvi herstart перезапус "yeniden başlat" restartuj "khởi động lại" 再起動 重启
    재시작
status: estado statut stato статус durum stan "trạng thái" ステータス 状态 狀態 상태
diff: unterschied diferenc différenc differenz verschil разниц различ fark różnic perbedaan 差分 差异 차이
download: herunterlad descarg télécharg baix scaric скачай скачать indir pobierz unduh "tải xuống" ダウンロード 下载
    下載 다운로드
upload: hochlad téléverse carreg caric "загрузи на" yükle prześlij unggah "tải lên" アップロード 上传 上傳 업로드
attachment: anhang adjunto "pièce jointe" anexo allegat bijlage вложен załącznik lampiran "đính kèm" 添付 附件 첨부
document: dokument documento документ belge dokumen "tài liệu" ドキュメント 文書 文档 문서
assign: zuweis asign assegn toewijz назнач przypisz tetapkan 割り当て 分配 指派 할당 배정
cancel: kündig cancela annul annulla opzeg отмен iptal anuluj batalkan hủy キャンセル 取消 취소
run: ausführ ejecut exécut execut esegu uitvoer выполн запуст çalıştır uruchom jalankan 実行 运行 執行 실행
query: abfrag consulta requête запрос sorgu zapytan kueri "truy vấn" クエリ 查询 쿼리
star: estrella étoile estrela stella звезд yıldız gwiazdk bintang スター 星标 스타
organization: organisation organización organização organizzazione organisatie организац kuruluş organizacj
    organisasi "tổ chức" 組織 组织 조직
workflow: "flujo de trabajo" "flux de travail" "fluxo de trabalho" "рабочий процесс" "iş akışı" ワークフロー 工作流
    워크플로
job: trabajo tâche tarefa lavoro taak задани zadani pekerjaan ジョブ 作业 任务 작업
reaction: reaktion reacción réaction reação reazione reactie реакц tepki reakcj reaksi リアクション 反应 반응
migration: migración migração migrazione migratie миграц migracj migrasi マイグレーション 迁移 마이그레이션
charge: cobro cargo débit cobrança addebito списан tahsilat obciążen 請求 扣款 청구
weather: wetter clima tiempo météo tempo meteo weer погод "hava durumu" pogod cuaca "thời tiết" 天気 天气 날씨
"""



# Arabic (ar), Persian (fa), Hebrew (he), Hindi (hi), Bengali (bn) and Thai (th): word starts after
# `text.normalized` (Arabic letters unified, the article and clitics taken off, Indic nukta dropped);
# Thai, written without spaces, matches as substrings. Loanwords as they are usually transliterated.
_GLOSSARY_SCRIPTS = """
create: أنشئ انشئ إنشاء انشاء اصنع بساز ایجاد צור תיצור बनाओ बनाएं बनाइए बना তৈরি สร้าง
new: جديد جديدة جدید חדש नया नई नए নতুন ใหม่
delete: احذف حذف امسح "حذف کن" پاک בטל מחק हटाओ हटाएं मिटाओ ডিলিট মুছে ลบ
list: اعرض قائمة فهرست רשימה सूची লিস্ট তালিকা รายการ
show: اعرض أظهر اظهر أرني ارني نمایش "نشان بده" הצג תראה दिखाओ दिखाएं दिखाइए দেখাও দেখান แสดง ดู
search: ابحث بحث جستجو جست חפש खोजो खोजें ढूंढो ढूंढें খোঁজ ค้นหา หา
find: جد اعثر پیدا מצא ढूंढ খুঁজ
read: اقرأ قراءة بخوان خواندن קרא पढ़ो पढ़ें পড় อ่าน
write: اكتب بنویس כתוב लिखो লেখ เขียน
edit: عدل تعديل ویرایش ערוך संपादित বদল แก้ไข
update: حدث تحديث بروزرسانی עדכן अपडेट আপডেট อัปเดต
open: افتح باز פתח खोलो খোল เปิด
close: أغلق اغلق ببند סגור बंद বন্ধ ปิด
send: أرسل ارسل بفرست שלח भेजो भेजें পাঠাও ส่ง
post: انشر منشور پست פרסם पोस्ट পোস্ট โพสต์
message: رسالة رساله پیام הודעה संदेश मैसेज বার্তা মেসেজ ข้อความ
channel: قناة قناه کانال ערוץ चैनल চ্যানেল ช่อง
reply: رد ردی پاسخ השב जवाब উত্তর ตอบ
file: ملف فایل پرونده קובץ फ़ाइल फाइल ফাইল ไฟล์
directory: مجلد دليل پوشه תיקייה फ़ोल्डर फोल्डर डायरेक्टरी ফোল্ডার โฟลเดอร์
branch: فرع شاخه ענף ברנץ ब्रांच শাখা ব্রাঞ্চ สาขา แบรนช์
repository: مستودع مخزن ریپازیتوری מאגר रिपॉजिटरी रिपोजिटरी রিপোজিটরি ที่เก็บ รีโพ
pull request: "طلب سحب" "پول ریکوئست" "पुल रिक्वेस्ट" "পুল রিকোয়েস্ট" พูลรีเควสต์
issue: تذكرة مشكلة تیکت כרטיס טיקט इश्यू टिकट ইস্যু টিকিট ตั๋ว ปัญหา
bug: خطأ باگ באג बग ত্রুটি บั๊ก
comment: تعليق نظر תגובה टिप्पणी কমেন্ট মন্তব্য ความคิดเห็น
commit: كوميت کامیت קומיט कमिट কমিট คอมมิต
page: صفحة صفحه עמוד पेज পৃষ্ঠা পেজ หน้า
project: مشروع پروژه פרויקט प्रोजेक्ट परियोजना প্রজেক্ট โปรเจกต์ โครงการ
customer: عميل مشتری לקוח ग्राहक গ্রাহক ลูกค้า
invoice: فاتورة فاکتور חשבונית इनवॉइस चालान ইনভয়েস ใบแจ้งหนี้
payment: دفع پرداخت תשלום भुगतान পেমেন্ট การชำระเงิน
refund: استرداد بازپرداخت החזר रिफंड ফেরত คืนเงิน
subscription: اشتراك اشتراک מנוי सदस्यता সাবস্ক্রিপশন การสมัคร
log: سجلات سجل لاگ گزارش לוג יומן लॉग লগ ล็อก บันทึก
alarm: إنذار انذار تنبيه هشدار התראה अलार्म अलर्ट এলার্ম สัญญาณเตือน
database: "قاعدة بيانات" "پایگاه داده" "מסד נתונים" डेटाबेस ডেটাবেস ฐานข้อมูล
table: جدول טבלה टेबल तालिका টেবিল ตาราง
screenshot: "لقطة شاشة" "اسکرین شات" "צילום מסך" स्क्रीनशॉट স্ক্রিনশট ภาพหน้าจอ
browser: متصفح مرورگر דפדפן ब्राउज़र ব্রাউজার เบราว์เซอร์
click: انقر کلیک לחץ क्लिक ক্লিক คลิก
web: ويب وب אינטרנט वेब ওয়েব เว็บ
restaurant: مطعم مطاعم رستوران מסעדה रेस्टोरेंट रेस्तरां রেস্টুরেন্ট ร้านอาหาร
cafe: مقهى كافيه کافه "בית קפה" कैफ़े कैफे ক্যাফে คาเฟ่ ร้านกาแฟ
near: قريب بالقرب نزدیک ליד קרוב पास नज़दीक কাছে ใกล้
directions: اتجاهات مسیر "הוראות הגעה" रास्ता দিকনির্দেশ เส้นทาง
distance: مسافة فاصله מרחק दूरी দূরত্ব ระยะทาง
time: الساعة ساعة وقت زمان ساعت שעה זמן समय बजे সময় কটা เวลา กี่โมง
keyword: "كلمة مفتاحية" "كلمات مفتاحية" "کلمه کلیدی" "מילת מפתח" कीवर्ड কীওয়ার্ড คีย์เวิร์ด คำค้น
backlink: "روابط خلفية" "رابط خلفي" "بک لینک" "קישור נכנס" बैकलिंक ব্যাকলিংক แบ็คลิงก์
domain: نطاق دامنه דומיין डोमेन ডোমেইন โดเมน
website: موقع سایت אתר वेबसाइट ওয়েবসাইট เว็บไซต์
email: بريد ايميل ایمیل דואל אימייל ईमेल ইমেইল อีเมล
release: إصدار اصدار انتشار ריליס גרסה रिलीज़ রিলিজ รีลีส
deploy: نشر استقرار دیپلوی פריסה डिप्लॉय তৈনাত ডিপ্লয় ดีพลอย
deployment: النشر نشر دیپلویمنت פריסה डिप्लॉयमेंट ডিপ্লয়মেন্ট
pod: بود پاد פוד पॉड পড พ็อด
namespace: "مساحة الأسماء" "فضای نام" "מרחב שמות" नेमस्पेस নেমস্পেস เนมสเปซ
restart: "أعد تشغيل" "إعادة تشغيل" "اعادة تشغيل" "راه اندازی مجدد" "הפעל מחדש" रीस्टार्ट "পুনরায় চালু" รีสตาร์ท
status: حالة وضعیت סטטוס מצב स्थिति स्टेटस অবস্থা สถานะ
diff: فرق تفاوت הבדל अंतर डिफ পার্থক্য ความแตกต่าง
assign: عين تعيين اختصاص הקצה असाइन বরাদ্দ มอบหมาย
run: شغل تشغيل نفذ اجرا הרץ चलाओ চালাও รัน เรียกใช้
query: استعلام کوئری שאילתה क्वेरी কোয়েরি คิวรี
error: أخطاء خطا שגיאה त्रुटि एरर ত্রুটি ข้อผิดพลาด
"""


def _parse(text: str) -> dict[str, str]:
    import shlex

    forms: dict[str, str] = {}
    english = ""
    for line in text.strip().splitlines():
        if not line.startswith(" "):  # "term: forms…"; an indented line goes on with the same term
            english, _, line = line.partition(":")
        for form in shlex.split(line):
            forms.setdefault(normalized(form.lower()), english.strip())
    return forms


FORMS = {**{k: v for k, v in _parse(_GLOSSARY_SCRIPTS).items()}, **_parse(_GLOSSARY)}
PHRASES = {f: e for f, e in FORMS.items() if " " in f or "-" in f}  # matched in the lowered text
WORD_STARTS = {f: e for f, e in FORMS.items() if f not in PHRASES}
LONGEST = max(len(f) for f in FORMS)
